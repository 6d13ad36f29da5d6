"""Wire protocols, one package each: pure sans-IO codecs and state machines (no asyncio)."""
