"""One step per local state: create, poll, cancel, collect, complete."""
