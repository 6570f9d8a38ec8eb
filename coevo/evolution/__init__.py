"""AEGIS, the harness evolution engine: Digester, Planner, Evolver and Critic, with variants, gates and monitors."""
