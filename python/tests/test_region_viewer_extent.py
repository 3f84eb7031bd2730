"""examples/python/region_viewer.py draws the region's blocks where they are:
lat0/lon0 are the first block's centre, the image's edges half a block out
(outside review of issue 28, NIT 10: the plot was shifted by half a block)."""
import importlib.util
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def load():
    spec = importlib.util.spec_from_file_location(
        "region_viewer", os.path.join(ROOT, "examples", "python", "region_viewer.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_extent_is_the_blocks_edges():
    rv = load()
    # the full globe in 4 x 8 blocks of 45 degrees: centres -67.5..67.5, 22.5..337.5
    ev = {"lat0": -67.5, "lon0": 22.5, "dlat": 45.0, "dlon": 45.0, "nlat": 4, "nlon": 8}
    assert rv.extent(ev) == [0.0, 360.0, -90.0, 90.0]
