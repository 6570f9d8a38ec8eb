"""Agents that are programs: the transport between a program's model requests and coevo's episodes.

``chat_api`` reads OpenAI chat-completions requests and writes responses; ``channel`` is one
episode's queue of requests; ``endpoint`` is the OpenAI-compatible HTTP server any program can be
pointed at. The env side (``coevo.envs.program_env``, ``command_env``, ``verifiers_env``) launches
programs; the episode side (``coevo.agent.program_episode``) answers them with the policy.
"""
