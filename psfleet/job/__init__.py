"""A job's settings, resolved once (DESIGN.md, milestone 3): today each training mode's
traits (:mod:`psfleet.job.modes`)."""

from psfleet.job.modes import MODE_SPECS, ModeSpec, mode_spec

__all__ = ["MODE_SPECS", "ModeSpec", "mode_spec"]
