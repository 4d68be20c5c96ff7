"""Sans-I/O session core (:mod:`.core`), its asyncio driver (:mod:`.runner`) and the manager."""
