"""The file formats trainsim reads and writes: one pydantic model and one reader (and writer, where trainsim
writes the file) per kind, each with its schema version. Nothing here imports the simulator
(`trainsim.sim`) or the measurement code (`trainsim.calibrate`): both import their inputs from here.

    scenario.py, scenario_options.py, scenario_loader.py   trainsim.scenario/1
    bundle.py                                             the calibration bundle (trainsim.calibration/1)
"""
