"""The Python tests' check of refused calls."""


def assert_value_errors(test, cases):
    """For each (call, message) in cases: call() raises ValueError whose text contains message,
    each in its own subTest, so one failing case does not hide the others."""
    for call, message in cases:
        with test.subTest(message=message):
            with test.assertRaises(ValueError) as caught:
                call()
            test.assertIn(message, str(caught.exception))
