"""verl compatibility: the verl keys megarl accepts without implementing (accepted_keys) and the check
of their values (check), keys of other verl versions it refuses (unsupported), and verl's migration of
legacy keys (legacy)."""
