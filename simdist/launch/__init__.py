"""Launching: ``simdist run`` (:mod:`simdist.launch.run`), ``spawn`` and ``enumerate_schedules``, torchrun's
flags, the scripts a simulated rank runs, ``simdist calibrate`` and ``simdist app``."""
