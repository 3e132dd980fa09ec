"""Lightning callbacks (the only part of the package that imports Lightning, with sinks)."""
