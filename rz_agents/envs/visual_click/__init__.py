"""A small visual task for vision-language policies: click the named button in a rendered picture."""

from rz_agents.envs.visual_click.env import ENV_ID, VisualClickEnv

__all__ = ["ENV_ID", "VisualClickEnv"]
