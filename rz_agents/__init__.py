"""rz_agents: async REINFORCE Zero for tool-using and computer-using LLM agents."""

__version__ = "0.1.0"
