"""tidewire: a Python event-streaming hub."""
