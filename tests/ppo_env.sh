# .venv-ppo: TRL 1.12.0, the last release with PPOTrainer, for the tests marked `ppo`. Sourced by tests/run.sh (after
# tests/envs.sh): `ppo_setup` builds the environment, `ppo_tests ARGS` runs those tests there (run.sh passes the -m
# expression). Pins: tests/constraints-ppo.txt.

ppo_setup() {
    setup_env .venv-ppo tests/constraints-ppo.txt -e ".[train,test]" "trl==1.12.0"
}

ppo_tests() {
    side_pytest ppo "$@"
}
