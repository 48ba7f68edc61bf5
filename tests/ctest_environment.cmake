# Read by ctest before it runs the tests (TEST_INCLUDE_FILES): the programs the tests start
# print each console message on one line (MINIMIND_CONSOLE_WIDTH=0), so that a test finds a
# message by its text whatever its length. console_width.sh unsets it and checks the wrapping
# users see.
set(ENV{MINIMIND_CONSOLE_WIDTH} 0)
