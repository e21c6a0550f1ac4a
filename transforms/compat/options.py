"""The patch of Beam's pipeline options: each view made once per options object (RunOptions)."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from transforms.compat.beam import beam_patch
from transforms.compat.patches import SPEED, put_in


def _views_present() -> bool:
    # A view writes through to the options' shared dictionary (so one view per class serves every call), and
    # the options pickle through __getstate__ (which leaves the views behind).
    return "_all_options" in PipelineOptions.__init__.__code__.co_names and hasattr(PipelineOptions, "__getstate__")


#: Beam builds a view, an argparse parser included, at every ``view_as`` call: about 300 while a small build's
#: graph is built and run.
OPTIONS_VIEWS = beam_patch(
    name="options-views-once",
    purpose=SPEED,
    target="apache_beam.options.pipeline_options.PipelineOptions.view_as",
    present=_views_present,
    apply=lambda: None,  # RunOptions keeps its views once the patch is in
)


class RunOptions(PipelineOptions):
    """Beam's pipeline options for one run, each view (``view_as``) made once and kept (OPTIONS_VIEWS).

    A view holds no state of its own (its values live in the options' shared dictionary, which it writes
    through), so one view per options class serves every call.
    """

    def view_as(self, cls):
        if not put_in(OPTIONS_VIEWS):
            return super().view_as(cls)
        views = self.__dict__.setdefault("_views", {})  # (PipelineOptions.__setattr__ would store it as an option)
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop("_views", None)  # views are remade where the options are unpickled
        return state
