"""What drives a run: the session, its scenarios and variants, check. May import all of run/ but run/bisect/."""
