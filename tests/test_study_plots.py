"""The regime plots' labels: a cluster of cells at nearly the same point stays readable."""

import random

import matplotlib.pyplot as plt
from matplotlib.text import Text

from study import plots


def _boxes(fig, labels):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [Text.get_window_extent(label, renderer) for label in labels]


def test_labels_of_a_dense_cluster_cover_neither_each_other_nor_a_point():
    rng = random.Random(1)
    cells = [
        (f"cell-{i}=x", {1: 1.1 + rng.random() * 0.2, 2: 1.15}, {1: rng.random(), 2: 0.5})
        for i in range(12)
    ]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    placed = plots._cell_points(ax, cells, "tab:blue")
    ax.plot([0, 5], [0, 17])  # the axes' limits as a plot's fit line would stretch them
    ax.legend(["line"], loc="center right")
    labels = plots._place_labels(ax, placed)
    boxes = _boxes(fig, labels)
    assert [label.get_text() for label in labels] == [name for name, _ in placed]
    overlapping = [
        (labels[a].get_text(), labels[b].get_text())
        for a in range(len(boxes))
        for b in range(a)
        if boxes[a].overlaps(boxes[b])
    ]
    assert overlapping == []
    points = [ax.transData.transform(xy) for _, xy in placed]
    assert not any(box.contains(px, py) for box in boxes for px, py in points)
    legend = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert not any(box.overlaps(legend) for box in boxes)
    plt.close(fig)


def test_a_lone_cell_is_labelled_beside_its_point_without_a_line():
    fig, ax = plt.subplots()
    placed = plots._cell_points(ax, [("base", {1: 1.0}, {1: 2.0})], "tab:blue")
    ax.set_xlim(0, 2)
    ax.set_ylim(0, 4)
    (label,) = plots._place_labels(ax, placed)
    assert label.xyann == (4, 4) and label.arrow_patch is None
    plt.close(fig)
