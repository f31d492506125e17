"""Example agents: ``openai_letters_agent`` (an OpenAI-SDK agent with a tool; configs/openai-agent.yaml)."""
