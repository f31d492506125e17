"""Harbor terminal tasks (task directories with an instruction, a task.toml, an environment, a verifier
and a reference solution) run in a bubblewrap shell sandbox: ``rz_agents/ShellTask-v0``."""
