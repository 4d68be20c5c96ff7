"""The HTTP edge shared by every route: who may call (:mod:`.access`), bounded bodies
(:mod:`.bodies`), one error shape (:mod:`.errors`), typed request and response models
(:mod:`.schemas`) and the keyed OpenAPI document (:mod:`.docs`)."""
