"""The small colour/shape vocabulary shared by synthetic pairs and the built-in prompts.

Kept in one place so that a colour word in a prompt always means the same RGB value,
whichever component (synthetic data, a colour reward) reads it.
"""

# Saturated, well separated colours: a tiny model can tell any two apart.
COLOUR_RGB: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.8, 0.2),
    "blue": (0.1, 0.2, 0.9),
    "yellow": (0.95, 0.9, 0.1),
    "cyan": (0.1, 0.85, 0.9),
    "magenta": (0.85, 0.1, 0.8),
}

SHAPES: tuple[str, ...] = ("square", "circle", "stripe")
