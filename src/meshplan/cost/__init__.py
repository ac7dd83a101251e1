"""Cost model: parameters and FLOPs, memory, collectives, compute, and the step that composes them."""
