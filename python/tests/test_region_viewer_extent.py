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


def test_axes_show_the_box_asked_for():
    rv = load()
    # the default box 0-90 N, 0-180 E of the example's 5-degree grid in 2x2
    # blocks: 19 columns of blocks, the last one partial, drawn to 187.5
    ev = {"lat0": 2.5, "lon0": 2.5, "dlat": 10.0, "dlon": 10.0, "nlat": 10, "nlon": 19,
          "region": {"lat_min": 0, "lat_max": 90, "lon_min": 0, "lon_max": 180, "stride": 2}}
    assert rv.extent(ev)[1] == 187.5
    assert rv.limits(ev) == ((0, 180), (0, 90))
    # a box across 0 degrees east runs past 360 on the axis (labelled modulo 360)
    ev["region"] = {"lat_min": -30, "lat_max": 30, "lon_min": 300, "lon_max": 60, "stride": 2}
    assert rv.limits(ev) == ((300, 420), (-30, 30))
