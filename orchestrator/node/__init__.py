"""Node: what runs on a GPU node: the core agent and allocator, the restriction and its verification, the vLLM replica, telemetry and host facts."""
