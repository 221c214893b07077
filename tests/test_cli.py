from typer.testing import CliRunner

from spa.cli import app

runner = CliRunner()


def test_envs_lists_every_env_with_defaults():
    result = runner.invoke(app, ["envs"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for name in ("sokoban", "frozenlake", "sudoku", "num_boxes", "is_slippery", "difficulty"):
        assert name in result.output


def test_play_reads_actions_and_quits_on_eof():
    # Seed 0 of the default FrozenLake, without slipping: the first move is deterministic.
    result = runner.invoke(app, ["play", "frozenlake", "-o", "is_slippery=false"], input="jump\nRight\n")
    assert result.exit_code == 0, result.output
    assert "invalid action" in result.output
    assert "reward" in result.output and "Player at" in result.output


def test_play_quit_command():
    result = runner.invoke(app, ["play", "sokoban", "--seed", "2"], input="quit\n")
    assert result.exit_code == 0 and "Box at" in result.output


def test_play_rejects_bad_options_with_a_clear_message():
    result = runner.invoke(app, ["play", "sokoban", "-o", "dim=2"], terminal_width=200)
    assert result.exit_code == 2 and "dim=2" in result.output
    result = runner.invoke(app, ["play", "sokoban", "-o", "nokey"], terminal_width=200)
    assert result.exit_code == 2 and "key=value" in result.output
    result = runner.invoke(app, ["play", "tetris"], terminal_width=200)
    assert result.exit_code == 2 and "sokoban" in result.output


def test_demo_runs_on_the_tiny_model():
    result = runner.invoke(
        app, ["demo", "--model", "tiny", "--env", "sudoku", "--episodes", "1", "--turns", "2",
              "--max-new-tokens", "8"],
    )
    assert result.exit_code == 0, result.output
    assert "episode 1" in result.output and "0/1 episodes solved" in result.output
