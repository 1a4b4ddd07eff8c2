"""One fit of a `Learner`, as objects.

`prepare.py` readies a fit (`FitParts`, what it acts with, and `FitState`, where it
stands), `loop.py` runs its epochs (`TrainLoop`), `stepper.py` takes each optimizer
step (`Stepper`), `epoch_end.py` validates and ends splits and epochs,
`evaluation.py` is the one evaluation pass (validation, validation points, the
pre-flight check and the `Evaluator`), `events.py` tells listeners and callbacks,
and `finish.py` closes a fit however it ended.
"""
