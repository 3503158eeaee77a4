"""``python -m sim.npu_device``: build the npu device's extension into the cache (or find it
there) and print the library's path; one line on stderr and exit status 1 when it does not
build (`sim.npu_device.build`). ``make test``'s set-up and ``.ci/run`` run it."""

import sys

from sim.npu_device.build import main

if __name__ == "__main__":
    sys.exit(main())
