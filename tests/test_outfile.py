"""Writing ``--out`` files: text and pictures, and one ``out`` error naming the file when the
file system refuses."""

from __future__ import annotations

import pytest

from meshplan.cli.outfile import write_text
from meshplan.errors import InputError
from meshplan.pyplot import pyplot, save_figure


def test_write_text_writes_utf8(tmp_path):
    path = tmp_path / "a.svg"
    write_text(path, "<svg>µs → ±</svg>\n")
    assert path.read_bytes() == "<svg>µs → ±</svg>\n".encode("utf-8")


def test_write_text_names_the_file_it_cannot_write(tmp_path):
    path = tmp_path / "gone" / "a.svg"
    with pytest.raises(InputError) as err:
        write_text(path, "x")
    assert err.value.field == "out" and str(err.value) == f"out: cannot write '{path}': No such file or directory"
    with pytest.raises(InputError, match=r"^out: cannot write '~/as typed\.svg': "):
        write_text(path, "x", "~/as typed.svg")  # named as the user wrote it
    assert not path.parent.exists()


def test_save_figure_writes_and_closes(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = tmp_path / "f.png"
    save_figure(plt, fig, path, dpi=50, format="png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)


def test_save_figure_error_still_closes(tmp_path):
    plt = pyplot()
    fig, _ = plt.subplots()
    path = tmp_path / "gone" / "f.svg"
    with pytest.raises(InputError) as err:
        save_figure(plt, fig, path)
    assert err.value.field == "out" and f"cannot write '{path}'" in str(err.value)
    assert not plt.fignum_exists(fig.number)
