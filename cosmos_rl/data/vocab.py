"""The colour/shape vocabulary shared by synthetic pairs, the built-in prompts and the colour reward.

Kept in one place so that a colour word in a prompt always means the same RGB value, whichever
component (synthetic data, the `prompt_colour` reward) reads it.
"""

# Every colour word the project understands, as 0..255 RGB.
COLOUR_RGB255: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "orange": (255, 128, 0),
    "purple": (128, 0, 128),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "gray": (128, 128, 128),
    "grey": (128, 128, 128),
}

# The well-separated colours synthetic pairs and built-in prompts draw from: any two differ by a
# full channel, so a tiny model can tell them apart.
PALETTE: tuple[str, ...] = ("red", "green", "blue", "yellow", "cyan", "magenta")

# The palette as 0..1 floats, the form images take inside the project.
COLOUR_RGB: dict[str, tuple[float, float, float]] = {
    name: tuple(channel / 255 for channel in COLOUR_RGB255[name]) for name in PALETTE
}

SHAPES: tuple[str, ...] = ("square", "circle", "stripe")
