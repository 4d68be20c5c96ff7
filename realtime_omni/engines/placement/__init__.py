"""Scale-out: model workers as Ray actors placed by free capacity (``serve --ray ADDRESS``).

Ray is an optional extra (``pip install 'realtime-omni[ray]'``); importing this package does not
import Ray, connecting (``RayModel.load``) does.
"""

from .model import RayModel, Worker
from .session import RaySession, RayVADSession

__all__ = ["RayModel", "RaySession", "RayVADSession", "Worker"]
