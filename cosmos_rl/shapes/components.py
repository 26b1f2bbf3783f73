"""Connected-component labelling and per-component statistics for a batch, in plain numpy.

Pixels carry a class (>= 1 for an object colour, <= 0 for background or unassigned); two pixels
belong to one component when a 4-connected path of pixels of their class joins them. Each pixel
starts labelled with its own flat index; every sweep takes the smallest label among same-class
4-neighbours and then jumps each label to its label's label (pointer jumping), so a component
settles on its smallest index in a few sweeps. The whole batch is labelled at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def label(classes: np.ndarray) -> np.ndarray:
    """Component labels for int classes [N, H, W]: for each object pixel the smallest flat index
    (into the [N, H, W] array) of its component; -1 elsewhere.

    Worked example, one 1x5 image with classes [1, 1, 0, 2, 2] -> labels [0, 0, -1, 3, 3];
    classes [1, 2, 2, 1, 1] -> [0, 1, 1, 3, 3] (same class but not connected: two components).
    """
    n, height, width = classes.shape
    none = n * height * width
    live = classes > 0
    labels = np.where(live, np.arange(none).reshape(n, height, width), none)
    # joins[:, y, x] is True when pixel (y, x) and its right (resp. lower) neighbour connect.
    join_x = live[:, :, 1:] & (classes[:, :, 1:] == classes[:, :, :-1])
    join_y = live[:, 1:, :] & (classes[:, 1:, :] == classes[:, :-1, :])
    while True:
        new = labels.copy()
        np.minimum(new[:, :, :-1], np.where(join_x, labels[:, :, 1:], none), out=new[:, :, :-1])
        np.minimum(new[:, :, 1:], np.where(join_x, labels[:, :, :-1], none), out=new[:, :, 1:])
        np.minimum(new[:, :-1, :], np.where(join_y, labels[:, 1:, :], none), out=new[:, :-1, :])
        np.minimum(new[:, 1:, :], np.where(join_y, labels[:, :-1, :], none), out=new[:, 1:, :])
        flat = new.reshape(-1)
        object_pixels = flat < none
        flat[object_pixels] = flat[flat[object_pixels]]
        if np.array_equal(new, labels):
            break
        labels = new
    return np.where(live, labels, -1)


@dataclass(frozen=True)
class Components:
    """Statistics of every component of a batch, one entry per component (arrays of equal length).

    Coordinates are pixel centres (x + 0.5, y + 0.5); boxes are in whole pixels, inclusive.
    """

    image: np.ndarray  # which image of the batch
    klass: np.ndarray  # the class of its pixels
    area: np.ndarray
    cx: np.ndarray
    cy: np.ndarray
    x0: np.ndarray
    x1: np.ndarray
    y0: np.ndarray
    y1: np.ndarray
    # [n, 8] how far the component reaches from its centroid towards +x, -x, +y (down), -y (up)
    # and the four diagonals (+x+y, +x-y, -x+y, -x-y): the largest projection of a pixel centre
    # plus the half-width of a pixel seen from that direction (0.5 along an axis, 1/sqrt 2 along
    # a diagonal), so a full r x r block reaches r/2 along each axis.
    reach: np.ndarray

    def __len__(self) -> int:
        return len(self.area)


def components(classes: np.ndarray) -> Components:
    """Label ``classes`` [N, H, W] and measure each component; ordered by (image, first pixel).

    One 2x2 block at x, y in {0, 1}: area 4, centroid (1, 1), box 0..1 x 0..1, reach 1 along
    each axis (pixel centre 0.5 away + 0.5) and 2 * 0.5 / sqrt 2 + 1 / sqrt 2 = sqrt 2 along
    each diagonal.
    """
    n, height, width = classes.shape
    labels = label(classes).reshape(-1)
    pixels = np.flatnonzero(labels >= 0)
    owner = labels[pixels]
    order = np.argsort(owner, kind="stable")
    pixels, owner = pixels[order], owner[order]
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]]) if len(owner) else np.zeros(0, int)
    roots = owner[starts]
    ys = (pixels // width) % height
    xs = pixels % width
    area = np.diff(np.r_[starts, len(pixels)])
    which = np.repeat(np.arange(len(starts)), area)  # each pixel's component

    def reduce(values: np.ndarray, op: np.ufunc) -> np.ndarray:
        return op.reduceat(values, starts) if len(starts) else np.zeros(0, values.dtype)

    cx = reduce(xs, np.add) / np.maximum(area, 1) + 0.5
    cy = reduce(ys, np.add) / np.maximum(area, 1) + 0.5
    dx, dy = xs + 0.5 - cx[which], ys + 0.5 - cy[which]
    diagonal = 1 / np.sqrt(2)
    reach = [reduce(d, np.maximum) + 0.5 for d in (dx, -dx, dy, -dy)]
    reach += [reduce((sx * dx + sy * dy) * diagonal, np.maximum) + diagonal
              for sx, sy in ((1, 1), (1, -1), (-1, 1), (-1, -1))]
    return Components(
        image=roots // (height * width),
        klass=classes.reshape(-1)[roots],
        area=area,
        cx=cx,
        cy=cy,
        x0=reduce(xs, np.minimum), x1=reduce(xs, np.maximum),
        y0=reduce(ys, np.minimum), y1=reduce(ys, np.maximum),
        reach=np.stack(reach, axis=1).reshape(-1, 8),
    )
