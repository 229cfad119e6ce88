"""Run: launch one recipe as a child process (litgpt's own command or tunelab's loop), watch it, collect its record;
sweeps of many runs, resumable."""
