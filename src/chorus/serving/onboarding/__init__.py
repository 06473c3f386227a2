"""Onboarding: from an upload to a voice. The uploads and their form checked before any job exists
(:mod:`.uploads`, :mod:`.upload_form`), a custom voice's consent and sample checked (:mod:`.consent_checks`,
with :mod:`.consent_phrase` and :mod:`.consent_speech`), the jobs that train voices (:mod:`.job_runner`,
in a process of their own per job: :mod:`.job_process`), the check a refined voice must pass
(:mod:`.refinement`) and the memory a job gives back (:mod:`.heap`). The only part of serving that runs
training code."""
