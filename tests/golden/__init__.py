"""Golden session logs: files written by an earlier version that every later one must restore."""
