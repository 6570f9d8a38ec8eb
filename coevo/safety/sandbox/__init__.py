"""Running code the project did not write: processor source from the meta-agent, and the agent's
``python`` tool.

``source_policy`` checks processor source against a static policy and ``child_runner`` runs it in
a forked, time- and memory-limited child (same user and filesystem: the policy and the limits guard
against mistakes and casual escapes, not a kernel or interpreter bug). ``python_tool`` runs
free-form agent code in the bubblewrap jail of ``jail`` (an unprivileged uid with no capabilities,
its own namespaces, a read-only ``pivot_root``, a seccomp filter), and refuses to run it where that
jail cannot run unless the user opts into an unconfined mode.
Import from those modules; this package re-exports nothing.
"""
