"""Pure kubelet knowledge: configuration model, per-distribution layouts, merge rules, validation.

Nothing in this package performs I/O beyond reading the files it is pointed at; rendering and
linting are deterministic functions of their inputs.
"""
