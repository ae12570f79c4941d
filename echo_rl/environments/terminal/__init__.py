"""Terminal tasks: sandboxed shell episodes over Harbor-layout task directories, verified after the episode."""
