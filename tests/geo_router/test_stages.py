from __future__ import annotations

from geo_router.stages import Stages


def test_stages_follow_one_another_in_server_timing() -> None:
    stages = Stages(10.0)
    stages.mark("auth", 10.0002)
    stages.mark("plan", 10.0005)
    stages.mark("upstream", 10.4130)
    assert stages.server_timing() == "auth;dur=0.20, plan;dur=0.30, upstream;dur=412.50"
    assert [n for n, _, _ in stages.spans()] == ["auth", "plan", "upstream"]
