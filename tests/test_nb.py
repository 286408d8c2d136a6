"""preln.nb.glue: myst-nb's glue where the book's toolchain is installed, a plain display without it."""
import pytest

from preln import nb


def test_is_myst_nb_glue_in_the_book_environment():
    myst_nb = pytest.importorskip("myst_nb", reason="myst-nb is the book's build stack (requirements.txt)")
    assert nb.HAVE_MYST_NB and nb._myst_glue is myst_nb.glue


def test_falls_back_to_showing_the_value(monkeypatch, capsys):
    monkeypatch.setattr(nb, "_myst_glue", None)
    nb.glue("ratio", 1.25, display=False)
    nb.glue("name", "int8")
    assert capsys.readouterr().out == "ratio = 1.25\nname = 'int8'\n"


def test_name_must_be_a_string():
    with pytest.raises(TypeError, match="name: expected a non-empty string"):
        nb.glue(3, 1.0)


def test_sig_says_a_number_at_its_precision():
    from preln.nb import sig

    said = [sig(v) for v in (0.634, 99.7, 65504, 4.73e-4, 1e-5, 3.4e38, -0.53, 0.0, 2.14e6)]
    assert said == ["0.63", "100", "66000", "4.7e−4", "1e−5", "3.4e38", "−0.53", "0", "2.1e6"]
    assert sig(0.8, zeros=True) == "0.80" and sig(4.0, zeros=True) == "4.0" and sig(0.8) == "0.8"
    assert sig(65504, 3) == "65500" and sig(float("nan")) == "NaN" and sig(float("-inf")) == "−infinity"
    from preln.nb import listed

    assert listed(["a", "b", "c"]) == "a, b and c" and listed(["a"]) == "a" and listed([]) == ""
    from preln.nb import fixed

    assert fixed(-0.981) == "−0.98" and fixed(-0.001) == "0.00" and fixed(1.963, 1) == "2.0"
    from preln.nb import span

    assert span([160.2, 345.4, 200]) == "160 to 345" and span([1.0101, 1.0102]) == "1.01"
