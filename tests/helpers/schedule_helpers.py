"""What the schedule's event-loop tests share: a server rule whose arrivals are counted and bounded."""

from __future__ import annotations

from stalesgd.schedule._parameter_server import ServerRule


def count_arrivals(server: ServerRule, most: int) -> list[tuple[int, int, int]]:
  """Makes ``server.receive`` record each gradient it gets, and fail the test at the first one past ``most``: a
  simulation loop that would run forever fails at once instead of hanging the tests. Returns the record."""
  receive, arrivals = server.receive, []

  def counted(*arguments):
    arrivals.append(arguments)
    assert len(arrivals) <= most, f"the loop went on receiving gradients past {most}"
    return receive(*arguments)

  server.receive = counted
  return arrivals
