"""A plugin for the CLI tests: a drone site and pool answering from a JSON file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lifecycle.machines.drone_sim import ScenarioBatch, ScenarioSite
from lifecycle.scenario import World

world = World(status=json.loads(Path(os.environ["DRONE_WORLD"]).read_text()))
drone_site = ScenarioSite(world)
drone_batch_system = ScenarioBatch(world)
