"""The judge: a task set's rewards, metrics and group rewards over rollouts -> `scored`.
`role.py` is its door; `judging.py` waits for groups and scores them."""
