"""How a dead actor is reported: the cause the actor raised, not Ray's generic first sentence."""

from cosmos_rl.dist.ray_group import _cause_line


def test_the_actors_own_error_line_is_the_cause():
    text = (
        "The actor died because of an error raised in its creation task, ray::NFTWorker.__init__()\n"
        '  File "worker.py", line 3, in __init__\n'
        "    raise ValueError('first')\n"
        "ValueError: first\n"
        "\nDuring handling of the above exception, another exception occurred:\n"
        "cosmos_rl.errors.UserError: model.path: folder not found (got \"/x\")\n"
    )
    assert _cause_line(RuntimeError(text)) == 'cosmos_rl.errors.UserError: model.path: folder not found (got "/x")'


def test_a_message_without_a_traceback_keeps_its_first_line():
    assert _cause_line(RuntimeError("the node died\nmore")) == "the node died"
