"""Small example envs showing how to write a custom :class:`~rz_agents.envs.MultiTurnTextEnv`."""
