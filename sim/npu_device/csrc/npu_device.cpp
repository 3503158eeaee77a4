// The simulated NPU as a PrivateUse1 device: the C++ that torch needs to see a device type.
//
// Shape (PyTorch's out-of-tree device example, test/cpp_extensions/open_registration_extension
// in pytorch/pytorch, its pytorch_openreg variant): the C++ stays thin and forwards every
// decision to a driver object written in Python (sim/npu_device/driver.py), which asks the
// simulator. This file holds only what must be C++:
//
// * the device allocator (REGISTER_ALLOCATOR): the driver's malloc / free hand out host
//   addresses the simulator owns, so an npu tensor's bytes are ordinary host memory that the
//   CPU kernels can read through an alias (cpu_aliases below), without a copy;
// * the pinned host allocator the PrivateUse1 hooks return from getPinnedMemoryAllocator
//   (torch.empty(..., pin_memory=True), Tensor.pin_memory(), Tensor.is_pinned()): real host
//   allocations whose addresses the hooks recognise in isPinnedPtr;
// * the device guard (current device, streams and events, forwarded to the driver: the
//   simulator's streams are the device's streams);
// * the default and new generators (CPU generators carrying the PrivateUse1 device);
// * the kernels that only set metadata or allocate (empty, empty_strided, as_strided, view,
//   _reshape_alias, unfold, view_as_real/complex, resize_, set_): every other op reaches the
//   Python fallback (sim/npu_device/fallback.py), which runs the CPU kernel on aliases.
//
// The code is this project's own; the example above is where the shape comes from.

#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/Generator.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace ascendgraph_npu {
namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;

// ------------------------------------------------------------------ the Python driver
// Set once by set_driver(); intentionally never released (the interpreter may be finalising
// when the last tensor dies).
py::object* g_driver = nullptr;

py::object driver_method(const char* name) {
  TORCH_CHECK(g_driver != nullptr, "sim.npu_device: the driver is not attached (sim.npu_device.driver)");
  return g_driver->attr(name);
}

std::atomic<int> g_device_count{1};
thread_local c10::DeviceIndex t_current_device = 0;

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < g_device_count.load(), "Invalid device id");
}

// ------------------------------------------------------------------ device memory
// The deleter of device memory: hand the address back to the driver (the simulator frees
// or caches the block). Errors are reported, never thrown: this runs in destructors.
void free_device_memory(void* ptr) {
  if (ptr == nullptr || !Py_IsInitialized() || g_driver == nullptr) {
    return;
  }
  py::gil_scoped_acquire gil;
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  try {
    driver_method("free")(reinterpret_cast<uintptr_t>(ptr));
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("sim.npu_device: freeing device memory");
  } catch (...) {
  }
  PyErr_Restore(type, value, traceback);
}

struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex index = t_current_device;
    void* data = nullptr;
    if (nbytes > 0) {
      py::gil_scoped_acquire gil;
      // The driver raises torch.OutOfMemoryError itself (torch_npu's text); the Python
      // exception travels back to the caller unchanged.
      data = reinterpret_cast<void*>(driver_method("malloc")(nbytes, index).cast<uintptr_t>());
    }
    return {data, data, &free_device_memory, c10::Device(kNpu, index)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_device_memory;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

DeviceAllocator g_device_allocator;
REGISTER_ALLOCATOR(kNpu, &g_device_allocator);

// A non-owning alias (torch_npu._C._weak_ref_tensor): the storage's DataPtr carries a token
// the driver gave out for the alias (which block, which generation of it) and frees nothing.
struct WeakToken {
  int64_t token;
};

void drop_weak_token(void* context) {
  auto* token = static_cast<WeakToken*>(context);
  if (token != nullptr && Py_IsInitialized() && g_driver != nullptr) {
    py::gil_scoped_acquire gil;
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
    try {
      driver_method("drop_weak")(token->token);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("sim.npu_device: dropping a weak alias");
    } catch (...) {
    }
    PyErr_Restore(type, value, traceback);
  }
  delete token;
}

// ------------------------------------------------------------------ pinned host memory
// Page-locked memory on a card; here ordinary host memory that the hooks know as pinned.
class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nullptr;
    if (nbytes > 0) {
      data = c10::alloc_cpu(nbytes);
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[reinterpret_cast<uintptr_t>(data)] = nbytes;
      bytes_ += nbytes;
    }
    return {data, data, &PinnedHostAllocator::release, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &PinnedHostAllocator::release;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool contains(const void* data) {
    const auto address = reinterpret_cast<uintptr_t>(data);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) {
      return false;
    }
    --it;
    return address < it->first + std::max<size_t>(it->second, 1);
  }

  size_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }

  static void release(void* ptr);

 private:
  void forget(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it != blocks_.end()) {
      bytes_ -= it->second;
      blocks_.erase(it);
    }
  }

  std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;
  size_t bytes_ = 0;
};

PinnedHostAllocator g_pinned_allocator;

void PinnedHostAllocator::release(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  g_pinned_allocator.forget(ptr);
  c10::free_cpu(ptr);
}

// ------------------------------------------------------------------ generators
// torch_npu's generator keeps philox state on the device; here a CPU generator that says it
// belongs to the npu device. The Python fallback lends its state to the CPU kernels.
struct NpuGenerator final : at::CPUGeneratorImpl {
  explicit NpuGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(kNpu, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

// One default generator per device index, made on first use (a deque: references handed out
// stay valid when a later index is added).
std::deque<at::Generator> g_default_generators;
std::mutex g_generators_mutex;

const at::Generator& default_generator_at(c10::DeviceIndex index) {
  check_index(index);
  std::lock_guard<std::mutex> lock(g_generators_mutex);
  while (static_cast<c10::DeviceIndex>(g_default_generators.size()) <= index) {
    g_default_generators.push_back(
        at::make_generator<NpuGenerator>(static_cast<c10::DeviceIndex>(g_default_generators.size())));
  }
  return g_default_generators[index];
}

// ------------------------------------------------------------------ hooks
struct NpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_index(device);
    t_current_device = device;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return t_current_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto previous = t_current_device;
    if (device >= 0) {
      check_index(device);
      t_current_device = device;
    }
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  bool isPinnedPtr(const void* data) const override {
    return g_pinned_allocator.contains(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  c10::Device getDeviceFromPtr(void*) const override {
    return c10::Device(kNpu, t_current_device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator_at(device_index < 0 ? t_current_device : device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    const c10::DeviceIndex index = device_index < 0 ? t_current_device : device_index;
    return at::make_generator<NpuGenerator>(index);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    // UntypedStorage.resize_() on the device: a new block, the old bytes copied over.
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

int register_hooks() {
  at::RegisterPrivateUse1HooksInterface(new NpuHooks());
  return 0;
}
const int g_hooks_registered = register_hooks();

// ------------------------------------------------------------------ device guard
struct NpuGuard final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = kNpu;

  NpuGuard() = default;
  explicit NpuGuard(c10::DeviceType type) {
    TORCH_INTERNAL_ASSERT(type == kNpu);
  }

  c10::DeviceType type() const override {
    return kNpu;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.is_privateuseone());
    const auto previous = t_current_device;
    if (device.has_index()) {
      check_index(device.index());
      t_current_device = device.index();
    }
    return c10::Device(kNpu, previous);
  }
  c10::Device getDevice() const override {
    return c10::Device(kNpu, t_current_device);
  }
  void setDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.is_privateuseone());
    if (device.has_index()) {
      check_index(device.index());
      t_current_device = device.index();
    }
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index()) {
      t_current_device = device.index();
    }
  }

  // Streams are the simulator's (sim/streams.py SimStream): a c10 StreamId is the SimStream's
  // stream_id on the current simulated NPU; the driver keeps the mapping.
  c10::Stream getStream(c10::Device device) const noexcept override {
    c10::StreamId id = 0;
    try {
      py::gil_scoped_acquire gil;
      id = driver_method("current_stream")(device.index()).cast<c10::StreamId>();
    } catch (...) {
    }
    return c10::Stream(c10::Stream::UNSAFE, device, id);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::UNSAFE, device, 0);
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    py::gil_scoped_acquire gil;
    const auto id = driver_method("new_stream")(device.index(), priority).cast<c10::StreamId>();
    return c10::Stream(c10::Stream::UNSAFE, device, id);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool high_priority) const override {
    return getNewStream(device, high_priority ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    c10::StreamId previous = 0;
    try {
      py::gil_scoped_acquire gil;
      previous = driver_method("exchange_stream")(stream.id(), stream.device_index()).cast<c10::StreamId>();
    } catch (...) {
    }
    return c10::Stream(c10::Stream::UNSAFE, stream.device(), previous);
  }
  bool queryStream(const c10::Stream& stream) const override {
    py::gil_scoped_acquire gil;
    return driver_method("query_stream")(stream.id(), stream.device_index()).cast<bool>();
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    py::gil_scoped_acquire gil;
    driver_method("synchronize_stream")(stream.id(), stream.device_index());
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    py::gil_scoped_acquire gil;
    driver_method("synchronize")(device_index);
  }

  // Events: the handle c10 keeps is an id the driver hands out (0 = not created yet).
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    py::gil_scoped_acquire gil;
    auto id = reinterpret_cast<intptr_t>(*event);
    if (id == 0) {
      id = driver_method("create_event")(device_index).cast<intptr_t>();
      *event = reinterpret_cast<void*>(id);
    }
    driver_method("record_event")(id, stream.id(), stream.device_index());
  }
  void block(void* event, const c10::Stream& stream) const override {
    const auto id = reinterpret_cast<intptr_t>(event);
    if (id == 0) {
      return;  // never recorded: nothing to wait for (as c10's contract says)
    }
    py::gil_scoped_acquire gil;
    driver_method("wait_event")(id, stream.id(), stream.device_index());
  }
  bool queryEvent(void* event) const override {
    const auto id = reinterpret_cast<intptr_t>(event);
    if (id == 0) {
      return true;
    }
    py::gil_scoped_acquire gil;
    return driver_method("query_event")(id).cast<bool>();
  }
  void synchronizeEvent(void* event) const override {
    const auto id = reinterpret_cast<intptr_t>(event);
    if (id == 0) {
      return;
    }
    py::gil_scoped_acquire gil;
    driver_method("synchronize_event")(id);
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    const auto id = reinterpret_cast<intptr_t>(event);
    if (id == 0 || !Py_IsInitialized() || g_driver == nullptr) {
      return;
    }
    try {
      py::gil_scoped_acquire gil;
      driver_method("destroy_event")(id);
    } catch (...) {
    }
  }
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override {
    TORCH_CHECK(false, "sim.npu_device: event timing is not modelled (the simulator has a virtual clock only)");
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuard);

// ------------------------------------------------------------------ metadata and allocation kernels
void check_factory(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "sim.npu_device: only strided tensors live on the npu device");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_factory(layout, pin_memory);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, &g_device_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_factory(layout, pin_memory);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, &g_device_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  // The storage's allocator is the device allocator: a larger block comes from the simulator.
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& set_whole_storage(at::Tensor& self, c10::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_device_allocator, /*resizable=*/true);
  return at::native::set_storage_cpu_(self, std::move(storage), 0, {0}, {});
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_whole_storage);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
}

// ------------------------------------------------------------------ functions for the Python side
void set_driver(py::object driver) {
  if (g_driver == nullptr) {
    g_driver = new py::object(std::move(driver));
  } else {
    *g_driver = std::move(driver);
  }
}

void set_device_count(int count) {
  TORCH_CHECK(count >= 1, "sim.npu_device: device_count must be at least 1, got ", count);
  g_device_count.store(count);
}

// A CPU tensor over the same bytes as an npu tensor (same offset, sizes, strides, dtype).
// Owning, it keeps the npu storage alive; not owning, it keeps nothing (the work the device
// runs later must not keep a block allocated the host has freed: the caller keeps the memory
// itself alive). Tensors on one storage share one CPU storage, so the CPU kernels see their
// aliasing (overlap checks, in-place views).
struct Aliases {
  std::vector<at::Tensor> tensors;
  std::vector<uintptr_t> bases;    // per tensor: the storage's base address (0: empty)
  std::vector<int64_t> weak;       // per tensor: the weak-alias token, or -1
};

Aliases cpu_aliases(const std::vector<at::Tensor>& tensors, bool owning) {
  Aliases out;
  out.tensors.reserve(tensors.size());
  std::vector<std::pair<const c10::StorageImpl*, c10::Storage>> made;
  for (const auto& tensor : tensors) {
    TORCH_CHECK(tensor.device().type() == kNpu, "cpu_aliases expects npu tensors, got one on ", tensor.device());
    const c10::Storage& storage = tensor.storage();
    const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
    c10::Storage cpu_storage;
    for (auto& entry : made) {
      if (entry.first == key) {
        cpu_storage = entry.second;
        break;
      }
    }
    if (!cpu_storage) {
      c10::DataPtr data = owning
          ? c10::DataPtr(const_cast<void*>(storage.data()), new c10::Storage(storage),
                         [](void* context) { delete static_cast<c10::Storage*>(context); }, c10::Device(c10::kCPU))
          : c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU));
      cpu_storage = c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data),
                                 /*allocator=*/nullptr, /*resizable=*/false);
      made.emplace_back(key, cpu_storage);
    }
    auto alias = at::detail::make_tensor<c10::TensorImpl>(std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                          tensor.dtype());
    alias.unsafeGetTensorImpl()->set_sizes_and_strides(tensor.sizes(), tensor.strides(), tensor.storage_offset());
    out.tensors.push_back(std::move(alias));
    out.bases.push_back(reinterpret_cast<uintptr_t>(storage.data()));
    auto* token = storage.data_ptr().cast_context<WeakToken>(&drop_weak_token);
    out.weak.push_back(token != nullptr ? token->token : -1);
  }
  return out;
}

// torch_npu._C._weak_ref_tensor: a tensor over the same device memory that owns nothing.
at::Tensor weak_alias(const at::Tensor& tensor, int64_t token) {
  TORCH_CHECK(tensor.device().type() == kNpu, "weak_alias expects an npu tensor, got one on ", tensor.device());
  const c10::Storage& storage = tensor.storage();
  c10::DataPtr data(const_cast<void*>(storage.data()), new WeakToken{token}, &drop_weak_token, tensor.device());
  c10::Storage weak_storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data), nullptr, false);
  auto alias = at::detail::make_tensor<c10::TensorImpl>(std::move(weak_storage),
                                                        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), tensor.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(tensor.sizes(), tensor.strides(), tensor.storage_offset());
  return alias;
}

int64_t weak_token(const at::Tensor& tensor) {
  auto* token = tensor.storage().data_ptr().cast_context<WeakToken>(&drop_weak_token);
  return token != nullptr ? token->token : -1;
}

py::object default_generator(int index) {
  const at::Generator& generator = default_generator_at(static_cast<c10::DeviceIndex>(index));
  return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(generator));
}

}  // namespace
}  // namespace ascendgraph_npu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace ascendgraph_npu;
  m.doc() = "The simulated NPU's PrivateUse1 device (sim/npu_device)";
  m.def("set_driver", &set_driver, "attach the Python driver the device forwards to");
  m.def("set_device_count", &set_device_count);
  m.def("device_count", []() { return g_device_count.load(); });
  m.def("current_device", []() { return static_cast<int>(t_current_device); });
  m.def("set_device", [](int index) {
    check_index(static_cast<c10::DeviceIndex>(index));
    t_current_device = static_cast<c10::DeviceIndex>(index);
  });
  m.def("cpu_aliases", [](const std::vector<at::Tensor>& tensors, bool owning) {
    auto aliases = cpu_aliases(tensors, owning);
    return py::make_tuple(aliases.tensors, aliases.bases, aliases.weak);
  });
  m.def("weak_alias", &weak_alias);
  m.def("weak_token", &weak_token);
  m.def("default_generator", &default_generator);
  m.def("pinned_bytes", []() { return g_pinned_allocator.bytes(); });
  m.def("is_pinned_address", [](uintptr_t address) { return g_pinned_allocator.contains(reinterpret_cast<void*>(address)); });
}
