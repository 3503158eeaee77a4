"""User tools built on the rules and the runtime: plan, doctor, diagnose, fault scenarios."""
