"""Research tools on top of training: the context ablation, capacity, the design check, weight soups."""
