"""Twilio Media Streams bridge: a phone call talks to a realtime session over 8 kHz μ-law.

Point a Twilio number's voice webhook at ``POST /v1/telephony/twilio/voice``; see
``examples/twilio_setup.md``.
"""

from .call import TwilioCall
from .playback import CarrierPlayback
from .routes import STREAM_PATH, VOICE_PATH, set_call_hook
from .routes import router as twilio_router

__all__ = ["STREAM_PATH", "VOICE_PATH", "CarrierPlayback", "TwilioCall", "set_call_hook", "twilio_router"]
