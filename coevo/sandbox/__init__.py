"""Running code the project did not write: processor source from the meta-agent, and the agent's
``python`` tool.

``source_policy`` checks processor source against a static policy and ``child_runner`` runs it in
a forked, time- and memory-limited child (same user and filesystem: the policy and the limits guard
against mistakes and casual escapes, not a kernel or interpreter bug). ``python_tool`` runs
free-form agent code in a Linux namespace jail where the kernel allows one (no network, a read-only
root, its own PID space), and in a limited process with a loud warning where it does not.
Import from those modules; this package re-exports nothing.
"""
