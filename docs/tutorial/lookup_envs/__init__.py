"""The tutorial's env package (docs/custom_env.md): importing it registers ``lookup_envs/KeyLookup-v0``."""

from rz_agents.envs import register_env

register_env("lookup_envs/KeyLookup-v0", "lookup_envs.env:KeyLookupEnv", max_turns=3)
