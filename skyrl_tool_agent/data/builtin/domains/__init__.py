"""The built-in domains, one module each, in build order."""

from __future__ import annotations

from skyrl_tool_agent.data.builtin.domains import (
    airline, hospital, hr, library, music, real_estate, retail, sports, university,
)
from skyrl_tool_agent.data.builtin.schema import Domain

DOMAINS: tuple[Domain, ...] = (
    library.DOMAIN, hospital.DOMAIN, university.DOMAIN, retail.DOMAIN, airline.DOMAIN,
    music.DOMAIN, hr.DOMAIN, real_estate.DOMAIN, sports.DOMAIN,
)
