from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .deep import *  # noqa: F403
