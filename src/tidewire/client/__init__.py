"""asyncio clients, one per protocol."""
