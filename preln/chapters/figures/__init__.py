"""Figure code of the book's chapters: one module per subject, so notebooks only import and call
(the chapters of a split subject share one: ``inference`` and ``inference_serving`` use
``figures.inference``, ``int8`` and ``int8_weight_only`` ``figures.int8``, ``precision`` and
``precision_fixes`` ``figures.precision``, ``derivation_ops``, ``derivation_ops_attention`` and
``derivation_ops_mlp`` ``figures.derivation``).

Each module defines ``EXPLORABLES``: a dict name -> (plot, controls), where ``plot(**values)``
returns a matplotlib Figure and ``controls`` maps each control's name to its list of values. The
notebooks show them with :func:`preln.chapters.viz.explorable`; ``python -m preln.bench --widgets`` times
every callback.
"""
import importlib

CHAPTERS = ("derivation", "derivation_block", "modern_block", "real_model", "shape_flow", "precision", "int8",
            "inference", "preln_vs_postln", "many_devices")


def all_explorables():
    """{"chapter.name": (plot, controls)} for every chapter module that exists."""
    found = {}
    for chapter in CHAPTERS:
        try:
            module = importlib.import_module(f"{__name__}.{chapter}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{chapter}":
                raise
            continue
        for name, entry in getattr(module, "EXPLORABLES", {}).items():
            found[f"{chapter}.{name}"] = entry
    return found
