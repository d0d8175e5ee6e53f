"""Python environments (Gymnasium's protocol with text): the protocol and fault-proof stepping,
built-in JAX environments wrapped as Python ones, a tool-use environment, a Gymnasium adapter."""

from bmrl.envs.python.protocol import EntryError, Fault, Stepper, check_env, load_entry

__all__ = ["EntryError", "Fault", "Stepper", "check_env", "load_entry"]
