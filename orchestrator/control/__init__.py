"""Control: the controller (retries, resume, concurrency; no Ray), the Ray executor and its placement book, and the run's own processes (services, lifelines, survivors, the home lock)."""
