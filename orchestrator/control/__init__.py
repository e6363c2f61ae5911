"""Control: the controller (retries, resume, concurrency; no Ray) and its trial state machine, the Ray executor and its placement book, and one window's measurement sequence (measure)."""
